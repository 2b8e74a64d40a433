Y fué la tarde y la mañana el día cuarto.
E hizo Dios animales de la tierra según su género, y ganado según su género, y todo animal que anda arrastrando sobre la tierra según su especie: y vió Dios que era bueno.
Mas no miró propicio á Caín y á la ofrenda suya. Y ensañóse Caín en gran manera, y decayó su semblante.
Una ventana harás al arca, y la acabarás á un codo de elevación por la parte de arriba: y pondrás la puerta del arca á su lado; y le harás piso bajo, segundo y tercero.
Y se cerraron las fuentes del abismo, y las cataratas de los cielos; y la lluvia de los cielos fué detenida.
Y la paloma volvió á él á la hora de la tarde; y he aquí que traía una hoja de oliva tomada en su pico: y entendió Noé que las aguas se habían retirado de sobre la tierra.
Y sucedió que en el año seiscientos y uno de Noé, en el mes primero, al primero del mes, las aguas se enjugaron de sobre la tierra; y quitó Noé la cubierta del arca, y miró, y he aquí que la faz de la tierra estaba enjuta.
Estos tres son los hijos de Noé; y de ellos fué llena toda la tierra.
Los hijos de Japhet: Gomer, y Magog, y Madai, y Javán, y Tubal, y Meshech, y Tiras.
Entonces Faraón llamó á Abram, y le dijo: ¿Qué es esto que has hecho conmigo? ¿Por qué no me declaraste que era tu mujer?
¿Hay para Dios alguna cosa difícil? Al tiempo señalado volveré á ti, según el tiempo de la vida, y Sara tendrá un hijo.
Entonces llovió Jehová sobre Sodoma y sobre Gomorra azufre y fuego de parte de Jehová desde los cielos;
Ahora pues, júrame aquí por Dios, que no faltarás á mí, ni á mi hijo, ni á mi nieto; sino que conforme á la bondad que yo hice contigo, harás tú conmigo, y con la tierra donde has peregrinado.
Sino que irás á mi tierra y á mi parentela, y tomarás mujer para mi hijo Isaac.
Y ABRAHAM tomó otra mujer, cuyo nombre fué Cetura;
Y los siervos de Isaac cavaron en el valle, y hallaron allí un pozo de aguas vivas.
Y llamólo Seba: por cuya causa el nombre de aquella ciudad es Beer-seba hasta este día.
Y Jacob dijo á Rebeca su madre: He aquí, Esaú mi hermano es hombre velloso, y yo lampiño:
Y él se llegó, y le besó; y olió Isaac el olor de sus vestidos, y le bendijo, y dijo: Mira, el olor de mi hijo como el olor del campo que Jehová ha bendecido:
Y dijo Rebeca á Isaac: Fastidio tengo de mi vida, á causa de las hijas de Heth. Si Jacob toma mujer de las hijas de Heth, como éstas, de las hijas de esta tierra, ¿para qué quiero la vida?
Y entró también á Rachêl: y amóla también más que á Lea: y sirvió con él aún otros siete años.
Y dijo Lea: Dios me ha dado una buena dote: ahora morará conmigo mi marido, porque le he parido seis hijos: y llamó su nombre Zabulón.
Y acordóse Dios de Rachêl, y oyóla Dios, y abrió su matriz.
Yo soy el Dios de Beth-el, donde tú ungiste el título, y donde me hiciste un voto. Levántate ahora, y sal de esta tierra, y vuélvete á la tierra de tu naturaleza.
Pues que has tentado todos mis muebles, ¿qué has hallado de todas las alhajas de tu casa? Ponlo aquí delante de mis hermanos y tuyos, y juzguen entre nosotros ambos.
Y envió Jacob mensajeros delante de sí á Esaú su hermano, á la tierra de Seir, campo de Edom.
Por esto no comen los hijos de Israel, hasta hoy día, del tendón que se contrajo, el cual está en el encaje del muslo: porque tocó á Jacob este sitio de su muslo en el tendón que se contrajo.
Mas con esta condición nos harán estos hombres el placer de habitar con nosotros, para que seamos un pueblo: si se circuncidare en nosotros todo varón, así como ellos son circuncidados.
Y murió Jobab, y en su lugar reinó Husam, de tierra de Temán.
El duque Cenaz, el duque Temán, el duque Mibzar,
Y LLEVADO José á Egipto, comprólo Potiphar, eunuco de Faraón, capitán de los de la guardia, varón Egipcio, de mano de los Ismaelitas que lo habían llevado allá.
Y acaeció que cuando vió ella que le había dejado su ropa en sus manos, y había huído fuera,
Y que del río subían siete vacas de gruesas carnes y hermosa apariencia, que pacían en el prado:
Y aquella abundancia no se echará de ver á causa del hambre siguiente, la cual será gravísima.
Y cuando se sintió el hambre en toda la tierra de Egipto, el pueblo clamó á Faraón por pan. Y dijo Faraón á todos los Egipcios: Id á José, y haced lo que él os dijere.
Y ellos le respondieron: No, señor mío: mas tus siervos han venido á comprar alimentos.
Aquel varón, señor de la tierra, nos habló ásperamente, y nos trató como á espías de la tierra:
Y aquel varón, señor de la tierra, nos dijo: En esto conoceré que sois hombres de verdad; dejad conmigo uno de vuestros hermanos, y tomad para el hambre de vuestras casas, y andad,
Y aconteció que vaciando ellos sus sacos, he aquí que en el saco de cada uno estaba el atado de su dinero: y viendo ellos y su padre los atados de su dinero, tuvieron temor.
Y PARTIÓSE Israel con todo lo que tenía, y vino á Beer-seba, y ofreció sacrificios al Dios de su padre Isaac.
Entonces Faraón habló á José, diciendo: Tu padre y tus hermanos han venido á ti;
Y Jacob bendijo á Faraón, y salióse de delante de Faraón.
Así José hizo habitar á su padre y á sus hermanos, y dióles posesión en la tierra de Egipto, en lo mejor de la tierra, en la tierra de Rameses como mandó Faraón.
Zabulón en puertos de mar habitará, y será para puerto de navíos; y su término hasta Sidón.
Y la hija de Faraón descendió á lavarse al río, y paseándose sus doncellas por la ribera del río, vió ella la arquilla en el carrizal, y envió una criada suya á que la tomase.
Entonces su hermana dijo á la hija de Faraón: ¿Iré á llamarte un ama de las Hebreas, para que te críe este niño?
Y Faraón respondió: ¿Quién es Jehová, para que yo oiga su voz y deje ir á Israel? Yo no conozco á Jehová, ni tampoco dejaré ir á Israel.
Así ha dicho Jehová: En esto conocerás que yo soy Jehová: he aquí, yo heriré con la vara que tengo en mi mano el agua que está en el río, y se convertirá en sangre:
Y tornando Faraón volvióse á su casa, y no puso su corazón aun en esto.
Y Moisés respondió: No conviene que hagamos así, porque sacrificaríamos á Jehová nuestro Dios la abominación de los Egipcios. He aquí, si sacrificáramos la abominación de los Egipcios delante de ellos, ¿no nos apedrearían?
Envía, pues, á recoger tu ganado, y todo lo que tienes en el campo; porque todo hombre ó animal que se hallare en el campo, y no fuere recogido á casa, el granizo descenderá sobre él, y morirá.
Y partieron los hijos de Israel de Rameses á Succoth, como seiscientos mil hombres de á pie, sin contar los niños.
E iba entre el campo de los Egipcios y el campo de Israel; y era nube y tinieblas para aquéllos, y alumbraba á Israel de noche: y en toda aquella noche nunca llegaron los unos á los otros.
Y la casa de Israel lo llamó Maná; y era como simiente de culantro, blanco, y su sabor como de hojuelas con miel.
Y descendió Jehová sobre el monte de Sinaí, sobre la cumbre del monte: y llamó Jehová á Moisés á la cumbre del monte, y Moisés subió.
Y cubrirás las tablas de oro, y harás sus anillos de oro para meter por ellos las barras: también cubrirás las barras de oro.
Y harás llegar sus hijos, y les vestirás las túnicas.
Así que guardaréis el sábado, porque santo es á vosotros: el que lo profanare, de cierto morirá; porque cualquiera que hiciere obra alguna en él, aquella alma será cortada de en medio de sus pueblos.
Y las tablas eran obra de Dios, y la escritura era escritura de Dios grabada sobre las tablas.
Entonces volvió Moisés á Jehová, y dijo: Ruégote, pues este pueblo ha cometido un gran pecado, porque se hicieron dioses de oro,
Y los ha henchido de sabiduría de corazón, para que hagan toda obra de artificio, y de invención, y de recamado en jacinto, y en púrpura, y en carmesí, y en lino fino, y en telar; para que hagan toda labor, é inventen todo diseño.
HIZO, pues, Bezaleel y Aholiab, y todo hombre sabio de corazón, á quien Jehová dió sabiduría é inteligencia para que supiesen hacer toda la obra del servicio del santuario, todas las cosas que había mandado Jehová.
Y cubrió las tablas de oro, é hizo de oro los anillos de ellas por donde pasasen las barras: cubrió también de oro las barras.
Hizo asimismo el velo de cárdeno, y púrpura, y carmesí, y lino torcido, el cual hizo con querubines de delicada obra.
E hizo las varas de madera de Sittim para llevar la mesa, y cubriólas de oro.
E hizo las varas de madera de Sittim, y cubriólas de oro.
Del cual hizo las basas de la puerta del tabernáculo del testimonio, y el altar de metal, y su enrejado de metal, y todos los vasos del altar.
El tercer orden, un ligurio, un ágata, y un amatista.
Hicieron también sobre el racional las cadenas pequeñas de hechura de trenza, de oro puro.
Y Moisés hizo conforme á todo lo que Jehová le mandó; así lo hizo.
Y los dos riñones, y el sebo que está sobre ellos, y el que está sobre los ijares, y con los riñones quitará el redaño de sobre el hígado.
Y mojará el sacerdote su dedo en la sangre, y rociará de aquella sangre siete veces delante de Jehová, hacia el velo del santuario.
Y cuando pecare el príncipe, é hiciere por yerro algo contra alguno de todos los mandamientos de Jehová su Dios, sobre cosas que no se han de hacer, y pecare;
Y de toda la ofrenda presentará una parte por ofrenda elevada á Jehová, y será del sacerdote que rociare la sangre de los pacíficos.
Y degollólo; y roció Moisés la sangre sobre el altar en derredor.
Y dijo á Aarón: Toma de la vacada un becerro para expiación, y un carnero para holocausto, sin defecto, y ofrécelos delante de Jehová.
Presentáronle después el holocausto, á trozos, y la cabeza; é hízolos quemar sobre el altar.
Tú, y tus hijos contigo, no beberéis vino ni sidra, cuando hubiereis de entrar en el tabernáculo del testimonio, porque no muráis: estatuto perpetuo por vuestras generaciones;
Y si cayere de sus cuerpos muertos sobre alguna simiente que se haya de sembrar, será limpia.
Y el hombre, cuando se le pelare la cabeza, es calvo, mas limpio.
Y cuando en el vestido hubiere plaga de lepra, en vestido de lana, ó en vestido de lino;
Y esta será su inmundicia en su flujo; sea que su carne destiló por causa de su flujo, ó que su carne se obstruyó á causa de su flujo, él será inmundo.
Esta es la ley del que tiene flujo, y del que sale derramamiento de semen, viniendo á ser inmundo á causa de ello;
Con esto entrará Aarón en el santuario: con un becerro por expiación, y un carnero en holocausto.
A fin de que traigan los hijos de Israel sus sacrificios, los que sacrifican sobre la haz del campo, para que los traigan á Jehová á la puerta del tabernáculo del testimonio al sacerdote, y sacrifiquen ellos sacrificios de paces á Jehová.
La desnudez de la hermana de tu padre no descubrirás: es parienta de tu padre.
Porque cualquiera que hiciere alguna de todas estas abominaciones, las personas que las hicieren, serán cortadas de entre su pueblo.
Y no rebuscarás tu viña, ni recogerás los granos caídos de tu viña; para el pobre y para el extranjero los dejarás: Yo Jehová vuestro Dios.
Que si escondiere el pueblo de la tierra sus ojos de aquel varón que hubiere dado de su simiente á Moloch, para no matarle,
Y guardad mis estatutos, y ponedlos por obra: Yo Jehová que os santifico.
O varón en el cual hubiere quebradura de pie ó rotura de mano,
Y el que por yerro comiere cosa sagrada, añadirá á ella su quinto, y darálo al sacerdote con la cosa sagrada.
Y si el peregrino ó extranjero que está contigo, adquiriese medios, y tu hermano que está con él empobreciere, y se vendiere al peregrino ó extranjero que está contigo, ó á la raza de la familia del extranjero;
Si aun fueren muchos años, conforme á ellos volverá para su rescate del dinero por el cual se vendió.
Y pondré mi morada en medio de vosotros, y mi alma no os abominará:
Y andaré entre vosotros, y yo seré vuestro Dios, y vosotros seréis mi pueblo.
Entonces la tierra holgará sus sábados todos los días que estuviere asolada, y vosotros en la tierra de vuestros enemigos: la tierra descansará entonces y gozará sus sábados.
En el año del jubileo, volverá la tierra á aquél de quien él la compró, cuya es la herencia de la tierra.
Y todo lo que apreciares será conforme al siclo del santuario: el siclo tiene veinte óbolos.
De Zabulón, Eliab hijo de Helón.
